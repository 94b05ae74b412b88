"""Reading what a tool says: its error envelope and its validation messages."""
