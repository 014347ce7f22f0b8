"""Trained components and their trainers: Medusa heads, the EAGLE head, the distilled draft, the
reduced draft vocabulary and head, REST's datastore, converters of released weights. Imports
training, assets, engine and base."""
