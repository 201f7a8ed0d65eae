#!/bin/sh
# Copies the files gen_hf.py wrote (in $1, default $OUT) into tokenizer/testdata/.
# Run from the repository root.
set -eu
src=${1:-${OUT:?give the folder gen_hf.py wrote to}}
td=tokenizer/testdata
mkdir -p $td/gpt2 $td/sp
gzip -9n -c "$src/gpt2_tokenizer.json" > $td/gpt2/tokenizer.json.gz
gzip -9n -c "$src/sp_tokenizer.json" > $td/sp/tokenizer.json.gz
for f in encode_qwen3.json encode_gpt2.json chat_template_qwen3.json log.txt; do
	cp "$src/$f" $td/ && chmod 644 $td/$f
done
gzip -9n -c "$src/encode_variants.json" > $td/encode_variants.json.gz
mv $td/log.txt $td/generator_log.txt
