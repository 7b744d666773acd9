"""The parts of `rl_env.vllm_server` that run without vLLM: which weight directories
`/update_weights` accepts, the command line it hands to `vllm serve`, and the files it loads."""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from rl_env.vllm_server import (
    WORKER_EXTENSION,
    _split_roots,
    _with_defaults,
    allowed,
    is_adapter_dir,
    safetensors_files,
)


class VllmServerTest(unittest.TestCase):
    def test_weight_dirs_must_lie_under_a_root_and_symlinks_out_are_refused(self):
        with tempfile.TemporaryDirectory() as root, tempfile.TemporaryDirectory() as other:
            step = os.path.join(root, "step_3")
            os.makedirs(step)
            self.assertTrue(allowed(step, [root]))
            self.assertTrue(allowed(root, [root]))
            self.assertFalse(allowed(other, [root]))
            self.assertFalse(allowed(os.path.join(root, "..", os.path.basename(other)), [root]))
            link = os.path.join(root, "escape")
            os.symlink(other, link)
            self.assertFalse(allowed(link, [root]))
            self.assertFalse(allowed(step, []), "no roots: every update is refused")

    def test_roots_are_taken_out_and_training_defaults_added(self):
        roots, rest = _split_roots(["--model", "m", "--weight-roots", "/a,/b", "--weight-roots=/c", "--port", "1"])
        self.assertEqual(roots, ["/a", "/b", "/c"])
        self.assertEqual(rest, ["--model", "m", "--port", "1"])
        args = _with_defaults(rest)
        self.assertEqual(args[args.index("--logprobs-mode") + 1], "processed_logprobs")
        self.assertEqual(args[args.index("--worker-extension-cls") + 1], WORKER_EXTENSION)
        self.assertEqual(args[args.index("--generation-config") + 1], "vllm")
        self.assertEqual(_with_defaults(["--generation-config", "auto"]).count("--generation-config"), 1)
        own = _with_defaults(["--logprobs-mode=raw_logprobs"])
        self.assertEqual([a for a in own if a.startswith("--logprobs-mode")], ["--logprobs-mode=raw_logprobs"])

    def test_weight_files_are_listed_in_order_and_an_empty_dir_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(FileNotFoundError):
                safetensors_files(d)
            for name in ["model-00002.safetensors", "model-00001.safetensors", "config.json"]:
                open(os.path.join(d, name), "w").close()
            self.assertEqual(
                [p.name for p in safetensors_files(d)], ["model-00001.safetensors", "model-00002.safetensors"]
            )

    def test_a_lora_adapter_directory_is_recognised_to_be_refused(self):
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "adapter_model.safetensors"), "w").close()
            self.assertFalse(is_adapter_dir(d), "weights without adapter_config.json are weights")
            open(os.path.join(d, "adapter_config.json"), "w").close()
            self.assertTrue(is_adapter_dir(d))


if __name__ == "__main__":
    unittest.main()
