"""The Python examples, run as the README says: under kolorun, with Debian's
interpreter, on a subset of Fashion-MNIST so that CI stays short."""
import os
import re
import subprocess
import sys
import tokenize

KOLORUN = os.environ["KOLORUN"]
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples",
                        "python")


def run(args, timeout=300):
    result = subprocess.run([KOLORUN, *args], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_import_line_is_the_only_kolo_specific_line():
    # Code only: comments and strings (the docstring's run command) may say kolo.
    with open(os.path.join(EXAMPLES, "fashion_mnist.py")) as f:
        lines = {token.line.strip() for token in tokenize.generate_tokens(f.readline)
                 if token.type not in (tokenize.COMMENT, tokenize.STRING)
                 and "kolo" in token.string}
    assert lines == {"import kolo.torch as hvd"}, lines


def test_fashion_mnist_on_two_workers():
    out = run(["-np", "2", sys.executable, os.path.join(EXAMPLES, "fashion_mnist.py"),
               "--epochs", "2", "--train-subset", "4096", "--test-subset", "1000"])
    assert "Fashion-MNIST: 2 worker(s), 4096 training images (2048 per worker)" in out, out
    accuracies = [float(a) for a in re.findall(r"test accuracy ([0-9.]+)", out)]
    assert len(accuracies) == 2, out
    assert accuracies[-1] > 0.65, out  # about 0.75 after 2 epochs of 4096 images


def test_fashion_mnist_elastic_on_two_workers():
    out = run(["-np", "2", "--min-np", "1", sys.executable,
               os.path.join(EXAMPLES, "fashion_mnist_elastic.py"), "--epochs", "1",
               "--train-subset", "2048", "--batches-per-commit", "4"])
    assert "done: 1 epoch(s) with 2 worker(s) at the end" in out, out
