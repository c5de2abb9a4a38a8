"""Write bpe_merges_16k.txt: the merges of a byte-level BPE of 16,384 tokens learnt from train.txt (notebook 13).

    python notebooks/data/shakespeare/bpe_merges.py

train_bpe(train.txt, 16384) learns 16,128 merges (16,384 - 256 bytes). Training is greedy and deterministic, so the
first V - 256 merges are the BPE of V tokens, for every V up to 16,384: notebook 13 reads this one file for every
vocabulary size of its figures (its learner has not written train_bpe yet there), and its Verify section trains
again and checks that the merges are these. One merge per line, after a comment line: the two tokens' bytes in
hexadecimal, separated by a space ("74 68" is (b"t", b"h")).
"""

from pathlib import Path

from transformer_from_scratch import train_bpe

HERE = Path(__file__).resolve().parent
VOCAB_SIZE = 16_384

if __name__ == "__main__":
    _, merges = train_bpe(HERE / "train.txt", VOCAB_SIZE)
    lines = [f"# {len(merges)} merges of train_bpe(train.txt, {VOCAB_SIZE}), in order: the two tokens' bytes in hex"]
    lines += [f"{left.hex()} {right.hex()}" for left, right in merges]
    (HERE / "bpe_merges_16k.txt").write_text("\n".join(lines) + "\n", encoding="ascii")
    print(f"wrote {len(merges):,} merges to bpe_merges_16k.txt")
