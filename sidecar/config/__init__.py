"""Configuration: the settings' models, where they come from, and how they are shown."""
