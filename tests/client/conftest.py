from tests.admin.conftest import _reset_logging, gateway_factory

__all__ = ["_reset_logging", "gateway_factory"]
