"""`transcribe serve --lm FILE --lm-weight W --hotwords ... --beam N`, from outside: the real server process and the
official `openai` client. The server fuses the LM and the phrases into every request's decoding as the one-shot CLI
does with the same options (the CLI is the reference for the wiring; the fusion's numbers are NeMo's in
test_beam.py and test_fusion.py), with its --beam or a request's own `beam`. A malformed LM or hotwords file stops
it before it serves, in one line.
"""

from __future__ import annotations

import openai
import pytest
from conftest import FIXTURES, NEMO_PATH
from test_cli import _error_lines, in_process
from test_server import KEY, REQUEST_SECONDS, cli, start_server
from test_server_hotwords import CLIP, PLAIN

LM = FIXTURES / "nemo-beam" / "lm.arpa"
FUSED = ("--lm", str(LM), "--lm-weight", "0.5", "--hotwords", PLAIN, "--boost", "1.5")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    served = start_server(tmp_path_factory.mktemp("fused") / "stderr.txt", *FUSED, "--beam", "4")
    yield openai.OpenAI(base_url=f"{served.url}/v1", api_key=KEY, max_retries=0, timeout=REQUEST_SECONDS)
    assert served.stop() == 0, served.log.read_text()


def _text(client, **extra_body) -> str:
    with open(CLIP, "rb") as f:
        return client.audio.transcriptions.create(file=f, model="tdt-tiny", extra_body=extra_body).text.strip()


def test_the_servers_lm_and_phrases_are_the_clis(client):
    """The server's --beam 4 answer is `transcribe --lm --hotwords --boost --beam 4`'s text; a request with beam=1
    gets the same models fused into greedy decoding (the CLI's text without --beam), one with beam=2 into a beam
    search of its own (--beam 2's). Each model counts on this clip: the text with both differs from the text of
    the beam alone, and from the beam with the LM alone."""
    beam, greedy, two = _text(client), _text(client, beam="1"), _text(client, beam="2")
    assert beam == cli(CLIP, *FUSED, "--beam", "4").strip()
    assert greedy == cli(CLIP, *FUSED).strip()
    assert two == cli(CLIP, *FUSED, "--beam", "2").strip() != cli(CLIP, "--beam", "2").strip()
    assert beam != greedy
    assert beam not in (cli(CLIP, "--beam", "4").strip(), cli(CLIP, *FUSED[:4], "--beam", "4").strip())


@pytest.mark.parametrize(
    "flag,content,problem",
    [("--lm", "\\data\\\nngram 1=x\n", "lm.arpa"), ("--hotwords-file", None, "hot.txt")],
)
def test_a_bad_lm_or_hotwords_file_stops_the_server_in_one_line(capsys, tmp_path, flag, content, problem):
    """A malformed ARPA file (found as the model loads, as a bad --model is) or a hotwords file that cannot be
    read (before the port is bound): exit 2, one line naming the file."""
    path = tmp_path / problem
    if content is not None:
        path.write_text(content)
    result = in_process(capsys, "serve", flag, path, "--device", "cpu", "--port", "0", model=str(NEMO_PATH))
    assert result.returncode == 2, result.stderr
    (line,) = _error_lines(result.stderr)
    assert str(path) in line and "Traceback" not in result.stderr, result.stderr
