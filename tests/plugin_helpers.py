"""A PE from outside the package, for the plugin tests: its source, as a file and as a really installed package.

The plugin is a learned ALiBi (a bias -m_h (i - j) whose slopes m_h are parameters, one per head and layer),
written against `tapecli.pe` only. Importing it leaves a marker file beside it (`<module>.imported`), so a test can
tell whether tape ran its code.

    path = write_plugin(tmp_path)                        # tmp_path/learned_alibi.py
    site = install_plugin(tmp_path)                      # pip install --target: tape-learned-alibi 0.1.0, entry
                                                         # point `learned-alibi` in the group tapecli.pe
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SOURCE = textwrap.dedent('''
    """Learned ALiBi: ALiBi's bias -m_h (i - j), with the slopes learned (one per head and layer)."""

    from pathlib import Path

    import torch
    from torch import nn

    from tapecli.pe import LayerPE, PositionalEncoding, ScoreBias

    Path(__file__).with_suffix(".imported").write_text("imported")


    class SlopeLayer(LayerPE):
        def __init__(self, heads: int, init: float) -> None:
            super().__init__()
            self.slopes = nn.Parameter(torch.full((heads,), init))

        def need(self, state, average_state):
            return ScoreBias(pairs=self.pairs, table=self.table, parameters=(self.slopes,))

        def pairs(self, q_pos, k_pos):
            distance = (q_pos[..., :, None] - k_pos[..., None, :]).to(self.slopes.dtype)
            return -self.slopes[:, None, None] * distance[:, None]

        def table(self, n):
            return -self.slopes[:, None] * torch.arange(n, dtype=self.slopes.dtype, device=self.slopes.device)

        def init_weights(self) -> None:
            nn.init.constant_(self.slopes, 0.25)


    class LearnedALiBi(PositionalEncoding):
        claims = ("shift-invariance",)

        def __init__(self, config, *, init: float = 0.25) -> None:
            super().__init__(config)
            self.init = init

        def make_layer(self, layer_idx):
            return SlopeLayer(self.config.n_heads, self.init)
''')

PACKAGE, VERSION, MODULE, NAME = "tape-learned-alibi", "0.1.0", "learned_alibi_pe", "learned-alibi"


def write_plugin(directory: Path, name: str = "learned_alibi.py") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(SOURCE)
    return path


def install_plugin(tmp: Path, package: str = PACKAGE) -> Path:
    """Build the package (a pyproject with the entry point) and pip-install it into tmp/site; returns tmp/site.
    Another `package` name makes a second distribution declaring the same entry point."""
    source = tmp / "src"
    write_plugin(source, f"{MODULE}.py")
    (source / "pyproject.toml").write_text(textwrap.dedent(f'''
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{package}"
        version = "{VERSION}"

        [tool.setuptools]
        py-modules = ["{MODULE}"]

        [project.entry-points."tapecli.pe"]
        {NAME} = "{MODULE}:LearnedALiBi"
    '''))
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(source)], check=True, capture_output=True)
    return site
