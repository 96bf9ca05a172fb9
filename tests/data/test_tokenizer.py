import hashlib

from data.tokenizer import GPT2_RANKS_FILE, gpt2_encoding


def test_gpt2_ids_match_openai_gpt2():
    enc = gpt2_encoding()
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.encode(" the") == [262]
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
    assert enc.n_vocab == 50257 and enc.eot_token == 50256


def test_text_round_trips_through_the_encoding():
    enc = gpt2_encoding()
    text = "To be, or not to be: that is the question.\n  Naïve café — 2024's 3.14 ✓"
    assert enc.decode(enc.encode_ordinary(text)) == text


def test_bundled_rank_file_is_the_published_one():
    digest = hashlib.sha256(GPT2_RANKS_FILE.read_bytes()).hexdigest()
    assert digest == "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
