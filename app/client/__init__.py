"""A client of a running gateway's admin API, for the ``eventgate events`` commands."""
