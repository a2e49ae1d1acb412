import unittest

try:
    import torch
except ImportError:  # the numpy-only set-up: nothing here can run
    torch = None

try:
    import transformers
except ImportError:
    transformers = None


@unittest.skipIf(torch is None or transformers is None, "needs torch and transformers")
class Beams(unittest.TestCase):
    def test_every_step_s_beams_are_the_best_candidates_of_the_one_before(self):
        from transformers import LlamaConfig, LlamaForCausalLM

        from golden_ref.beams import generate

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        model = LlamaForCausalLM(config).eval()
        ids = torch.tensor([[3, 7, 9], [1, 2, 2]])
        k, count, penalty = 3, 3, 2.0
        best, leaves = generate(model, ids, None, {"beams": k, "length_penalty": penalty}, count)
        leaves = dict(leaves)
        self.assertEqual(tuple(best.shape), (2, count))
        for j in range(count):
            logprobs, scores = leaves[f"beams.{j}.logprobs"], leaves[f"beams.{j}.scores"]
            self.assertEqual(tuple(logprobs.shape), (2, k, 32))
            # The log-probabilities are a log-softmax: each beam's sum to 1.
            torch.testing.assert_close(logprobs.exp().sum(-1), torch.ones(2, k))
            candidates = (logprobs + scores[:, :, None]).reshape(2, -1)
            top, index = candidates.topk(k)
            self.assertEqual(leaves[f"beams.{j}.from"].tolist(), (index // 32).tolist())
            self.assertEqual(leaves[f"beams.{j}.tokens"].tolist(), (index % 32).tolist())
            # Cumulative; at the last token, the finished hypotheses' length-penalised scores.
            expected = top / count ** penalty if j == count - 1 else top
            torch.testing.assert_close(leaves[f"beams.{j}.next"], expected)
            if j + 1 < count:
                self.assertEqual(leaves[f"beams.{j + 1}.sequences"][:, :, -1].tolist(), (index % 32).tolist())
        # The best beam is the first finished hypothesis.
        self.assertEqual(best[:, -1].tolist(), leaves[f"beams.{count - 1}.tokens"][:, 0].tolist())


if __name__ == "__main__":
    unittest.main()
