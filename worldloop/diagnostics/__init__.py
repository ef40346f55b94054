"""What watches RL, above the trainer (which does not import it): reality checks and the judge's calibration
(:mod:`~worldloop.diagnostics.reality`), warnings and stop rules (:mod:`~worldloop.diagnostics.warnings`), and the
monitor that runs them during training (:mod:`~worldloop.diagnostics.monitor`)."""
