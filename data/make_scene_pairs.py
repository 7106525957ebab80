#!/usr/bin/env python3
"""make_scene_pairs.py — two-image evaluation items from the scenes data set
(../shared/data/scenes/dev, the dev set of the project's VLM ekv-ref-vlm), for
`ekv eval` (JSONL with "images", one <image> marker each), so that image tokens
fill most of the cache (two images: 1,152 of ~1,200 prompt positions).

Three kinds, each with a fixed seed and balanced answers:
  compare    "Which image has more shapes, the first or the second?"  " the first." / " the second."
             (pairs whose counts differ; chance 0.5)
  second     a question of qa.jsonl about the SECOND image, with both images in
             the prompt (answer: the second image's)
  first      the same about the FIRST image ("... in the first image?")
  single     the same questions with their one image, as qa.jsonl asks them (the reference)
  wrong      the same questions with the OTHER image of the pair alone: how often the
             answer is right without seeing its image (the chance level of second/first)
The model was trained on one image per prompt: check the full cache's accuracy
against chance before reading anything into a policy's.

usage: make_scene_pairs.py SCENES_DEV_DIR OUT_DIR [N=100] [SEED=7]
writes OUT_DIR/pairs_compare.jsonl, pairs_second.jsonl, pairs_first.jsonl, pairs_single.jsonl,
pairs_wrong.jsonl;
run with --image-dir SCENES_DEV_DIR.
"""
import json
import os
import random
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 7)
    scenes = [json.loads(l) for l in open(os.path.join(src, 'scenes.jsonl'))]
    qa = [json.loads(l) for l in open(os.path.join(src, 'qa.jsonl'))]
    img = {s['id']: 'images/%s.png' % s['id'] for s in scenes}
    count = {s['id']: len(s['objects']) for s in scenes}
    os.makedirs(out, exist_ok=True)

    with open(os.path.join(out, 'pairs_compare.jsonl'), 'w') as f:
        k = 0
        while k < n:
            a, b = rng.sample(scenes, 2)
            if count[a['id']] == count[b['id']]:
                continue
            first = k % 2 == 0  # balanced: even items' answer is "the first"
            if (count[a['id']] > count[b['id']]) != first:
                a, b = b, a
            f.write(json.dumps({'id': 'cmp_%03d' % k, 'images': [img[a['id']], img[b['id']]],
                                'instruction': '<image>\n<image>\nWhich image has more shapes, the first or the second?',
                                'answer': ' the first.' if first else ' the second.', 'type': 'compare'}) + '\n')
            k += 1

    items = rng.sample(qa, n)  # the same questions for all three files
    with open(os.path.join(out, 'pairs_single.jsonl'), 'w') as f:
        for k, q in enumerate(items):
            f.write(json.dumps({'id': 'single_%03d' % k, 'image': q['image'], 'instruction': q['instruction'],
                                'answer': q['answer'], 'type': q['type']}) + '\n')
    others = [rng.choice([s for s in scenes if s['id'] != q['id'].rsplit('_q', 1)[0]]) for q in items]
    with open(os.path.join(out, 'pairs_wrong.jsonl'), 'w') as f:
        for k, (q, other) in enumerate(zip(items, others)):
            f.write(json.dumps({'id': 'wrong_%03d' % k, 'image': img[other['id']], 'instruction': q['instruction'],
                                'answer': q['answer'], 'type': q['type']}) + '\n')
    for which in ('second', 'first'):
        with open(os.path.join(out, 'pairs_%s.jsonl' % which), 'w') as f:
            for k, (q, other) in enumerate(zip(items, others)):
                sid = q['id'].rsplit('_q', 1)[0]
                pair = [img[other['id']], img[sid]] if which == 'second' else [img[sid], img[other['id']]]
                qi = q['instruction']
                question = (qi.replace(' in the image', ' in the %s image' % which) if ' in the image' in qi
                            else qi.rstrip('?') + ' in the %s image?' % which)
                f.write(json.dumps({'id': '%s_%03d' % (which, k), 'images': pair,
                                    'instruction': '<image>\n<image>\n' + question, 'answer': q['answer'],
                                    'type': q['type']}) + '\n')


if __name__ == '__main__':
    main()
