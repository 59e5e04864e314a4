"""The code that runs on GPU servers. It imports nothing from Django and needs no database."""

AGENT_VERSION = "0.1.0"
