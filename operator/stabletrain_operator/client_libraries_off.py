"""Imported first by `python -m stabletrain_operator`: kopf runs without the Kubernetes
client libraries, even where they are installed (the CLI needs the official client).

kopf imports the official client, kubernetes_asyncio and pykube whenever they are present,
to recognise their model objects, which the operator never hands it. The official client
alone brought some 270 modules and 9 MiB into the process. None in `sys.modules` makes
`import` raise ImportError, which kopf takes as "not installed". The operator's own
requests go through apiserver.py, and kopf logs in through credentials.py either way.
"""

import sys

for _library in ("kubernetes", "kubernetes_asyncio", "pykube"):
    if _library not in sys.modules:
        sys.modules[_library] = None  # type: ignore[assignment]
