"""Platform detection, named hardware profiles and measured ones (see detect.py, profiles.py, bandwidth.py)."""
