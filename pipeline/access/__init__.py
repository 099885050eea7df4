"""Permissions: who may read each evidence (``scope``) and the access settings (``settings``)."""
