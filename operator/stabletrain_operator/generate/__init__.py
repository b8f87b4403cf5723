"""What is generated from the models: the CRDs, docs/api.md and its table of field effects.

Above every other floor: it reads the API models, the pods' settings and the action
registry, and nothing at run time imports it (`make crds` runs it; `make lint` holds it).
"""
