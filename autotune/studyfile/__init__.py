"""The study file: what it says (spec.py: ``read_study_file`` -> ``StudySpec``, every error as ``FILE: [table] key:
what is allowed``), the search space it declares (space.py: suggestions -> candidates, config keys, the engine's
valid ranges) and the files autotune keeps beside it (paths.py)."""
from autotune.studyfile.paths import check as check_paths
from autotune.studyfile.space import Candidate, ServerFile, Space
from autotune.studyfile.spec import (
    ConstraintSpec,
    EngineSpec,
    HealthSpec,
    ParamSpec,
    StudySpec,
    WorkloadSpec,
    find_study_file,
    parse_study,
    read_study_file,
)

__all__ = ["Candidate", "ConstraintSpec", "EngineSpec", "HealthSpec", "ParamSpec", "ServerFile", "Space", "StudySpec",
           "WorkloadSpec", "check_paths", "find_study_file", "parse_study", "read_study_file"]
