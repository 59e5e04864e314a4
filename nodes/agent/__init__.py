"""The code that runs on GPU servers. It imports nothing from Django and needs no database."""
