"""Episode programs, the episode runner and the grader."""

from platoon.programs.grader import Grader
from platoon.programs.registry import Episode, ProgramError, get_program, program, program_names
from platoon.programs.runner import EntrySettings, EpisodeRunner

__all__ = [
    "EntrySettings",
    "Episode",
    "EpisodeRunner",
    "Grader",
    "ProgramError",
    "get_program",
    "program",
    "program_names",
]
