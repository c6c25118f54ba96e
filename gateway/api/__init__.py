"""Thin REST handlers and their request and response models, one module per resource."""
