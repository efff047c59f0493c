"""The operators' console at ``/console``: server-rendered pages over the admin service."""
