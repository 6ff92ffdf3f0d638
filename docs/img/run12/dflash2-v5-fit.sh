#!/bin/bash
# Twelfth session, issue 18: the shipped dflash2 (version 4, 2.56M block rows fitted) upgraded to version 5 (prompt
# lookup's candidates in its block rows; the new tensors start at zero, so it starts drafting exactly as the shipped
# file) and fitted on the same 960 generated answers, decay 2, lr 5e-4 cosine; one thread on core 1, bf16 autocast.
set -e
cd /work/main && . .venv/bin/activate
STDLIB=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
CORPUS="$STDLIB /usr/share/common-licenses py:pydoc_data.topics.topics"
OMP_NUM_THREADS=1 taskset -c 1 speclane fit-drafter --backend dflash2 --version 5 --corpus $CORPUS --work /work/fit-dflash12/v5 \
  --seed 0 --prompts 960 --heldout-prompts 32 --forced 0 --out /work/fit-dflash12/v5/out --steps 6000 --lr 5e-4 \
  --anchors 48 --decay 2 --init /work/main/stages/models/assets --checkpoint-every 1000 --threads 1
