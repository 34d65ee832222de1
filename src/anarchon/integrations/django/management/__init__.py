"""Django management commands of the anarchon app."""
