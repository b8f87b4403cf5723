"""The stabletrain trainer-agent: the in-pod library that watches a training run step by step."""
