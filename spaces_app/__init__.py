"""The comparison Space (`app.py`); `python -m spaces_app` serves it locally."""
