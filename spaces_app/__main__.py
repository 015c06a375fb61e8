"""`python -m spaces_app`: serve the comparison Space on 127.0.0.1 (see app.py for the configuration)."""

from spaces_app.app import main

main()
