"""The translation trainer's validation BLEU in the training loop: greedy decoding of the first --bleu-sentences
valid sentences at every evaluation after step 0 (an untrained model's BLEU is 0 and its greedy outputs run to the
length cap), on the uncompiled model: decoding runs ever-changing shapes."""
from eval.bleu import decode_cost, translate_and_score
from training.in_loop import InLoopEvaluation, Metric

BLEU = Metric("bleu", "valid BLEU (greedy)", "BLEU", fmt=".2f")


class ValidBleu(InLoopEvaluation):
    name = "bleu"
    metrics = (BLEU,)

    def __init__(self, trainer, ctx):
        """`trainer` (train_translation.py's) keeps the model, its sentencepiece model and the valid text."""
        super().__init__(trainer, ctx)
        self.model, self.sp, self.valid_text = trainer.model, trainer.sp, trainer.valid_text

    def due(self, step, last):
        return step > 0

    def run(self, step, last, model):
        src, ref = self.valid_text
        n = self.cfg.eval.bleu_sentences or len(src)
        with self.ctx.autocast:
            bleu, _, _, seconds = translate_and_score(self.model, self.sp, src[:n], ref[:n], self.cfg.eval,
                                                      self.ctx.dist, 1)
        return ({BLEU.name: bleu, "bleu_sentences": n, "bleu_seconds": seconds},
                f" | valid BLEU (greedy) {bleu:.2f} | {decode_cost(n, seconds)}")
