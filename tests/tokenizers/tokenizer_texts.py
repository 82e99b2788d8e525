"""The texts the tokenizer tests train on: the seed documents' corpora and a hostile mix.

A helper module (not a test module): the tests in this folder import it by name, as pytest's
default import mode puts this folder on sys.path.
"""

# Seed 000 (Step 1, "Our entire dataset containing only three sentences").
GOT = [
    "I drink and I know things.",
    "When you play the game of thrones, you win or you die.",
    "The true enemy won't wait out the storm, He brings the storm.",
]
# Seed 000 (Step 2): the word types it counts, in the order it lists them -> 23.
GOT_VOCAB = ["I", "drink", "and", "Know", "things", "When", "you", "play", "the", "game", "of",
             "thrones", "win", "or", "die", "true", "enemy", "won't", "wait", "out", "storm",
             "He", "brings"]

# Seed 001 (Byte Pair Encoding).
SEASHELLS = "she sells seashells by the seashore"

# A training text with whitespace of several kinds, punctuation, non-ASCII and non-BMP
# characters, and the strings "</w>" and "<pad>" inside words (they must stay ordinary text).
BPE_TRAIN = GOT + [
    SEASHELLS,
    "Größe café naïve 東京タワー 😀🚀 x</w>y <pad> a<unk>b",
    "tabs\tand\nnewlines,  double  spaces\u3000and\r\nCRLF ",
]
BPE_ALPHABET = sorted(set("".join(BPE_TRAIN)))
