"""``python manage.py anarchon``: the anarchon command with Django's settings."""
