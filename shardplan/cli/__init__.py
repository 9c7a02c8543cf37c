"""The face: thin typer commands (``app``) and the renderers that format their output."""
