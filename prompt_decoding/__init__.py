"""Placeholder: this paper's package is not built yet (see the open issues). Nothing here runs."""
