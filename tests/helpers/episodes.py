"""Multi-turn episode fixtures: a character tokenizer with tool tags, a scripted sampler that plays the
model, a calculator-using reply script, a TRL-style counter environment and a Hermes-style chat tokenizer."""

from grpokit.data.tasks.calculator import TAGS
from grpokit.data.tasks.chartok import ALPHABET, build_char_tokenizer
from grpokit.env.parse import CALL_CLOSE
from grpokit.types import Rollout

TOK = build_char_tokenizer(ALPHABET, TAGS)


def ids(text):
    return list(TOK(text, add_special_tokens=False)["input_ids"])


class ScriptedSampler:
    """Plays the model: ``reply(prompt, g, context) -> text``; records the rows of every decode."""

    def __init__(self, reply):
        self.reply, self.calls = reply, []

    def __call__(self, contexts, group_size, params):
        self.calls.append((len(contexts), group_size, tuple(params.stop)))
        comps, logps, reasons = [], [], []
        for k, ctx in enumerate(contexts):
            for g in range(group_size):
                text = self.reply(TOK.decode(ctx), g if group_size > 1 else None)
                t = ids(text)
                if text.endswith("<eos>"):
                    t = ids(text[:-5]) + [TOK.eos_token_id]
                comps.append(t)
                logps.append([-0.5] * len(t))
                reasons.append(
                    "eos" if t and t[-1] == TOK.eos_token_id else "stop" if text.endswith(CALL_CLOSE) else "length"
                )
        return Rollout([list(c) for c in contexts], comps, logps, reasons, group_size)


def calc_reply(context, g):
    """Row g = 0 answers from memory; others call the calculator, then answer with its result."""
    if g == 0:
        return "<answer>4200</answer><eos>"
    if "<tool_result>" not in context:
        a = context.split("=")[0]
        return f"<tool_call>{a}</tool_call>"
    return "<answer>" + context.split("<tool_result>")[-1].split("</tool_result>")[0] + "</answer><eos>"


class Counter:
    """A TRL-style environment: reset(**row), public methods are tools, get_reward, done."""

    def reset(self, prompt, answer, **kwargs):
        self.target, self.count, self.done = int(answer), 0, False
        return " go"

    def add(self, n: str) -> str:
        """Add n to the counter.

        Args:
            n: the amount.
        """
        self.count += int(n)
        self.done = self.count >= self.target
        return str(self.count)

    def get_reward(self) -> float:
        return float(self.count == self.target)


HERMES = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    '{% for c in m.tool_calls or [] %}<tool_call>{"name": "{{ c.function.name }}", "arguments": '
    "{{ c.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_tokenizer():
    import string

    tok = build_char_tokenizer(
        string.ascii_letters + string.digits + string.punctuation + " \n",
        ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"),
        model_max_length=None,
    )
    tok.add_special_tokens({"eos_token": "<|im_end|>"})
    tok.chat_template = HERMES
    return tok
