#!/bin/bash
# Thirteenth session, issue 18, second round: the file shipped at 2946e9e fitted 2,000 steps more on the 960 answers
# plus 1,440 answers to the code-generation ask (--write-prompts 1440: the first 480 the same asks as before), decay 2,
# lr 3e-4 cosine; one thread on core 0 (CI on core 1), bf16 autocast.
set -e
cd /work/main && . .venv/bin/activate
STDLIB=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
CORPUS="$STDLIB /usr/share/common-licenses py:pydoc_data.topics.topics"
OMP_NUM_THREADS=1 taskset -c 0 speclane fit-drafter --backend dflash2 --version 5 --corpus $CORPUS --work /work/fit-dflash13/v5w2 \
  --seed 0 --prompts 960 --write-prompts 1440 --heldout-prompts 32 --forced 0 --out /work/fit-dflash13/v5w2/out --steps 2000 --lr 3e-4 \
  --anchors 48 --decay 2 --init /work/main/stages/models/assets --checkpoint-every 1000 --threads 1
