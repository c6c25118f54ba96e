"""Passwords, tokens, API keys and encryption of stored secrets."""
