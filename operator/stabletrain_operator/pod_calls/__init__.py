"""The operator's calls to the agents' endpoints besides the scrape (observe/scrape.py):
`directive_put` (live directives), `supervisor_orders` (stop or start the training
processes of a pod restarted in place), and `capped_read`, which bounds every answer a pod
sends, the scrape's included.
"""
