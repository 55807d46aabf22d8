"""Platform detection and named hardware profiles (see detect.py, profiles.py)."""
