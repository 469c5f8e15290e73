"""Stage 7, record: metrics sinks, health monitors, samples, the HTML report and pass@k estimators.

    make_recorder(run_dir, sinks, total_steps, config)  -> Recorder   (recorder.py)
    NullRecorder()                                       the silent default for library use
    HealthConfig / HealthMonitor                         config/health.py, health.py
    group_signatures / solved_signatures                 signatures.py (the trainer adds them to its metrics)
    sample_rows(...)                                     rows for Recorder.log_samples (samples.py)
    write_report(run_dir)                                RUN_DIR/report.html, interactive (report.py, report_data.py)
    diagnose(load_run(run_dir))                          ranked findings of `grpokit doctor` (doctor.py)
    pass_at_k / maj_at_k / mean_at_k / summarize         evaluation estimators (passk.py)

See docs/MONITORING.md for the metric names, the sinks, the monitors and the report.
"""

from grpokit.config.health import HealthConfig

from .health import HealthEvent, HealthMonitor, TrainingHealthError
from .passk import maj_at_k, mean_at_k, pass_at_k, summarize
from .recorder import NullRecorder, Recorder, make_recorder
from .samples import sample_rows
from .signatures import group_signatures, solved_signatures

__all__ = [
    "HealthConfig",
    "HealthEvent",
    "HealthMonitor",
    "NullRecorder",
    "Recorder",
    "TrainingHealthError",
    "group_signatures",
    "solved_signatures",
    "maj_at_k",
    "make_recorder",
    "mean_at_k",
    "pass_at_k",
    "sample_rows",
    "summarize",
]
