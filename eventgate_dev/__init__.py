"""Stand-ins for eventgate's development and tests, outside the product's ``app`` package:
a fake Anthropic Messages API (``python -m eventgate_dev.fake_anthropic``) and an SNS/SQS
setup for the compose demo (``python -m eventgate_dev.sns_dev``). The image ships them so
``docker compose`` can run them from the same image."""
