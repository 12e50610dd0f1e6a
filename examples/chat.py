"""Chat: steer the reply of the embedded SmolLM2-135M-Instruct to a chat prompt.

`lm.apply_chat_template([...])` renders the messages with the model's chat
template (token ids), ending where the assistant's reply begins. The reply ends when the
model emits one of `lm.eos_token_ids` (SmolLM2 ends a turn with `<|im_end|>`).
Here every word of the reply must have at most `--max-letters` letters (a word is
a run of Unicode letters, so "français" counts 8); SMC steering keeps the
particles that can still satisfy that. The last lines say how many particles
ended their turn (the rest ran out of `--max-tokens`) and the longest word.

    python examples/chat.py --question "What is the capital of France?" --particles 8
"""

from __future__ import annotations

import argparse
import re

from llamppl import CachedCausalLM, LMContext, Model, run
from llamppl.inference import smc_steer

WORD = re.compile(r"[^\W\d_]+")  # runs of Unicode letters: "français" is one 8-letter word


class ShortWordReply(Model):
    def __init__(self, lm, messages, max_letters: int = 7, max_tokens: int = 40):
        super().__init__()
        self.context = LMContext(lm, lm.apply_chat_template(messages))  # + generation prompt
        self.max_letters, self.max_tokens = max_letters, max_tokens

    async def step(self):
        token = await self.sample(self.context.next_token())
        words = WORD.findall(self.reply())
        self.condition(all(len(w) <= self.max_letters for w in words))
        if token in self.context.lm.eos_token_ids or len(self.context.generated) >= self.max_tokens:
            self.finish()

    def reply(self) -> str:
        """The assistant's reply so far, without the end-of-turn token."""
        lm = self.context.lm
        return lm.decode([t for t in self.context.generated if t not in lm.eos_token_ids])

    def string_for_serialization(self) -> str:
        return self.reply()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--question", default="What is the capital of France?", help="the user's message"
    )
    parser.add_argument(
        "--system", default="You are a helpful assistant.", help="the system message"
    )
    parser.add_argument("--particles", type=int, default=8, help="N, particles kept per step")
    parser.add_argument("--beam", type=int, default=3, help="K, extensions per particle")
    parser.add_argument("--max-tokens", type=int, default=40, help="tokens per sample at most")
    parser.add_argument(
        "--max-letters", type=int, default=7, help="longest allowed word (Unicode letters)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed of the run")
    args = parser.parse_args()

    lm = CachedCausalLM.default()
    messages = [
        {"role": "system", "content": args.system},
        {"role": "user", "content": args.question},
    ]
    model = ShortWordReply(lm, messages, args.max_letters, args.max_tokens)
    print(f"Prompt ({len(model.context.tokens)} tokens):\n{model.context.prompt}")
    result = run(smc_steer(model, args.particles, args.beam, seed=args.seed, progress=False))

    print(f"Replies (no word longer than {args.max_letters} letters):")
    for text, weight in result.posterior.items():
        print(f"  weight {weight:6.3f}  {text!r}")
    ended = sum(p.context.finished for p in result.particles)
    print(
        f"{ended}/{len(result.particles)} particles ended their turn (emitted <|im_end|>); "
        f"the others stopped at --max-tokens {args.max_tokens} mid-reply"
    )
    longest = max((len(w) for t in result.posterior for w in WORD.findall(t)), default=0)
    print(f"longest word in any reply: {longest} letters (limit {args.max_letters})")
    print(f"log Z estimate: {result.log_ml:.3f}")


if __name__ == "__main__":
    main()
