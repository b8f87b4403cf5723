"""Entry module for `kopf run -m stabletrain_operator.main`: importing it registers handlers."""

from stabletrain_operator import handlers

__all__ = ["handlers"]
