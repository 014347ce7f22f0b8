# Helpers shared by the rule files (named functions, no lambdas in rules).
import json
from pathlib import Path

from common.models import MODELS, checkpoint_dir


def artifact_outputs(aid):
    """Files one artifact id writes under the profile's results root."""
    spec = ARTIFACTS[aid]
    base = f"{ROOT}/{spec['package']}"
    out = [f"{base}/notebooks/{aid}.ipynb"]
    if "table" in spec["outputs"]:
        out += [f"{base}/tables/{aid}.md", f"{base}/tables/{aid}.csv"]
    if "figure" in spec["outputs"]:
        out += [f"{base}/figures/{aid}.png"]
    return out


def all_targets():
    """The final target list: every registered artifact of the active profile."""
    return [f for aid in ARTIFACTS for f in artifact_outputs(aid)]


def model_files(wildcards=None):
    """The converted checkpoint when the profile's model is embedded; nothing for hub models."""
    spec = MODELS.get(P.model)
    if spec is not None and spec.package:
        return [str(checkpoint_dir(P.model) / "model.safetensors")]
    return []


def results_root_of(wildcards, output):
    """The results root, read back from an artifact's notebook path (<root>/<pkg>/notebooks/x)."""
    return str(Path(output.notebook).parents[2])


def group_decoders(wildcards):
    """Comma-separated decoders of one cross-benchmark group."""
    return ",".join(P.cross.groups[wildcards.group])


def artifact_inputs(aid):
    """Raw records an artifact reads; '{cross_groups}' expands to every benchmark group,
    '{cross_components}' to every trained component (medusa, draft) some group uses."""
    out = []
    for x in ARTIFACTS[aid]["inputs"]:
        if "{cross_groups}" in x:
            out += [f"{ROOT}/{x.replace('{cross_groups}', g)}" for g in P.cross.groups]
        elif "{cross_components}" in x:
            out += [f"{ROOT}/{x.replace('{cross_components}', c)}" for c in cross_components()]
        else:
            out.append(f"{ROOT}/{x}")
    return out


COMPONENT_FILES = {"{medusa}": "medusa/heads.pt", "{draft}": "draft/model/config.json"}
COMPONENT_DIRS = {"{medusa}": "medusa", "{draft}": "draft/model"}


def _group_config(group):
    labels = P.cross.groups[group]
    return {k: dict(v) for k, v in P.cross.decoder_config.items() if k in labels}


def cross_components():
    """Names of the trained components ('medusa', 'draft') that any benchmark group uses."""
    text = json.dumps([_group_config(g) for g in P.cross.groups])
    return [key.strip("{}") for key in COMPONENT_FILES if key in text]


def group_inputs(wildcards):
    """The model plus every trained component the group's decoders name."""
    text = json.dumps(_group_config(wildcards.group))
    comps = [f".cache/components/{P.name}/{f}" for key, f in COMPONENT_FILES.items() if key in text]
    return [*model_files(), *comps]


def group_decoder_config(wildcards):
    """The group's decoder options as JSON, component placeholders replaced by their folders."""
    text = json.dumps(_group_config(wildcards.group))
    for key, folder in COMPONENT_DIRS.items():
        text = text.replace(key, f".cache/components/{P.name}/{folder}")
    return text


def parent_of_heads(wildcards, output):
    """The Medusa output folder, read from its heads file."""
    return str(Path(output.heads).parent)


def parent_of_draft(wildcards, output):
    """The draft's output folder (the saved model sits in its model/ subfolder)."""
    return str(Path(output.model).parent.parent)
