"""Three of the most expensive requests at once, for scripts/deploy-check's replica kill.

    scripts/kill-burst PORT GO_FILE OUT_JSON
    python -m tools.kill_burst ...    # the same, from the repository root

Each is a /trace/batch at the work budget with a small answer: three weight
sets at d_model 512 to generate (~0.1-0.3 s of CPU) for ~200 KB of JSON, so a
replica killed soon after spends that time computing, not sending (nginx can
retry a request only until the first byte of its answer has gone to the
client: a replica that dies while streaming an answer cuts it short,
whatever the proxy). Computes each answer in-process first, touches GO_FILE
(deploy-check then SIGKILLs a replica), sends the three to 127.0.0.1:PORT at
once (one lands on each replica), and exits 0 only if all three come back 200
and byte-identical to the in-process answers.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3:
        raise SystemExit(__doc__.split("\n\n")[1])
    port, go, out = int(argv[0]), Path(argv[1]), Path(argv[2])
    # one BLAS thread, as each worker runs (gunicorn.conf.py): set before numpy loads its BLAS
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # the comparison at a tolerance lives with the recorded answers (tests/answer_values.py)
    sys.path.insert(0, str(ROOT / "tests"))
    from answer_values import document_differences  # type: ignore[import-not-found]  # tests/, on sys.path above

    from service import create_app

    client = create_app().test_client()
    bodies = [json.dumps({"items": [{"tokens": ["a", "b"], "d_model": 512, "num_heads": 8, "seed": 9000 + 3 * i + j}
                                    for j in range(3)]}).encode() for i in range(3)]
    refs = [client.post("/trace/batch", data=b, content_type="application/json").get_data() for b in bodies]
    results: list = [None] * 3

    def send(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            conn.request("POST", "/trace/batch", body=bodies[i], headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            body = resp.read()
            # the container's OpenBLAS may run another kernel than this process: the same structure, the
            # numbers within 1e-12 of their scale (docs/engine.md, "Versions and reproducibility")
            same = body == refs[i] or (resp.status == 200 and not document_differences(json.loads(refs[i]),
                                                                                        json.loads(body)))
            results[i] = [resp.status, same]
        except (OSError, http.client.HTTPException) as e:
            results[i] = [type(e).__name__, False]
        finally:
            conn.close()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    go.touch()
    for t in threads:
        t.join(90)
    out.write_text(json.dumps({"results": results}) + "\n")
    print("kill burst (status, identical):", results)
    return 0 if all(r == [200, True] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
