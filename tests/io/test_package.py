import subprocess
import sys


def test_io_imports_without_torch_or_transformers():
    code = ("import sys, surogate.io; "
            "heavy = [m for m in ('torch', 'transformers', 'huggingface_hub') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)
