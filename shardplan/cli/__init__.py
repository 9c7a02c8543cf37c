"""The face: the typer app (``app``), one module per command family (``fit_command``,
``plan_command``, ``sweep_command``, ``export_command``, ``profile_commands``; shared options in
``options``), and the renderers that format their output (``report``, ``plan_report``, ``layout``,
``progress``)."""
