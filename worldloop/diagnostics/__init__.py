"""What watches RL and the world model, above them (rl/ never imports it; ``worldloop rl`` injects it): reality checks
and the judge's calibration (:mod:`~worldloop.diagnostics.reality`), replays and how far imagination tracks reality
(:mod:`~worldloop.diagnostics.tracking`), warnings and stop rules (:mod:`~worldloop.diagnostics.warnings`), the
monitor that runs them during training (:mod:`~worldloop.diagnostics.monitor`), and the fidelity gate before RL
(:mod:`~worldloop.diagnostics.gate`)."""
