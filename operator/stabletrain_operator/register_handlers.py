"""Entry module of `kopf run -m stabletrain_operator.register_handlers`: importing it
registers the handlers."""

from stabletrain_operator import handlers

__all__ = ["handlers"]
