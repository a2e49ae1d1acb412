import unittest

try:
    import torch
except ImportError:  # the numpy-only set-up: nothing here can run
    torch = None

try:
    import transformers
except ImportError:
    transformers = None


SPEC = dict(temperature=0.7, top_k=6, top_p=0.8, min_p=0.05, repetition_penalty=1.3)


@unittest.skipIf(torch is None or transformers is None, "needs torch and transformers")
class Sampling(unittest.TestCase):
    def test_the_draw_is_the_inverse_cdf_in_vocabulary_order(self):
        from golden_ref.sampling import inverse_cdf

        probs = torch.tensor([[0.25, 0.0, 0.5, 0.25]])
        u = torch.tensor([[0.0, 0.2499, 0.25, 0.7499, 0.75, 0.9999]], dtype=torch.float64)
        self.assertEqual(inverse_cdf(probs, u).tolist(), [[0, 0, 2, 2, 3, 3]])
        # Probabilities that do not sum to 1: u scales with their sum; never a token of 0.
        probs = torch.tensor([[0.0, 0.2, 0.2, 0.0]])
        u = torch.tensor([[0.49, 0.51, 0.999999]], dtype=torch.float64)
        self.assertEqual(inverse_cdf(probs, u).tolist(), [[1, 2, 2]])

    def test_processors_are_transformers_own_in_transformers_order(self):
        from golden_ref.sampling import transformers_processors

        names = [type(p).__name__ for p in transformers_processors(SPEC)]
        self.assertEqual(names, ["RepetitionPenaltyLogitsProcessor", "TemperatureLogitsWarper",
                                 "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper"])
        # Nothing declared, nothing applied (generate()'s default top_k = 50 included).
        self.assertEqual(list(transformers_processors({})), [])

    def test_generate_draws_with_golden_s_uniforms_what_process_draws(self):
        from transformers import LlamaConfig, LlamaForCausalLM

        from golden_ref.sampling import generate, process

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        model = LlamaForCausalLM(config).eval()
        ids = torch.tensor([[3, 7, 9], [1, 2, 2]])
        uniforms = torch.rand(2, 4, dtype=torch.float64)
        with torch.no_grad():
            tokens, logits, probs = generate(model, ids, None, SPEC, uniforms)
        self.assertEqual(tuple(tokens.shape), (2, 4))
        previous = ids
        for j in range(4):
            answer = process(logits[j], previous, uniforms[:, j:j + 1], **SPEC)
            torch.testing.assert_close(answer["probs"], probs[j])
            self.assertEqual(answer["tokens"][:, 0].tolist(), tokens[:, j].tolist())
            previous = torch.cat([previous, tokens[:, j:j + 1]], dim=1)
        # The eos token of Llama's configuration (2) is drawn like any other: no end of sequence.
        self.assertIsNone(model.generation_config.eos_token_id)

    def test_each_mistake_changes_the_draws_where_it_applies(self):
        from golden_ref.sampling import MISTAKES, applies, process

        torch.manual_seed(1)
        logits = torch.randn(8, 12) * 0.7
        previous = torch.randint(0, 12, (8, 3))
        u = torch.rand(8, 64, dtype=torch.float64)
        right = process(logits, previous, u, **SPEC)
        for mistake in MISTAKES:
            if not applies(mistake, SPEC) or mistake in ("top-k-ties-by-index", "penalty-divides-all",
                                                        "skip-min-p"):
                continue  # ties, negative repeated logits, a min-p that binds: not in these logits
            wrong = process(logits, previous, u, **SPEC, mistake=mistake)
            self.assertFalse(torch.equal(wrong["tokens"], right["tokens"]), mistake)

    def test_the_probe_keeps_top_p_s_cut_off_ties(self):
        from golden_ref.sampling import _ambiguous, probe

        previous = torch.tensor([[1, 2]])
        for seed in range(20):
            logits = probe(seed, 32, SPEC, previous)
            self.assertTrue(torch.equal(logits, logits.round()))
            self.assertFalse(_ambiguous(SPEC, previous, logits))


if __name__ == "__main__":
    unittest.main()
