"""The trajectory viewer: a local web page over run directories (`platoon view`).

`index` keeps a SQLite index beside a run's event log so that a large run opens fast;
`runs` finds run directories and says what is wrong with the odd ones; `episodes` turns an
episode's events into its agent tree and a call's tokens into what the datums trained on;
`app` is the JSON API and the page; `export` writes a static copy.
"""

from platoon.visualization.index import RunIndex
from platoon.visualization.runs import Run, RunSet

__all__ = ["Run", "RunIndex", "RunSet"]
