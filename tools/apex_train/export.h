/* export.h: `apex-train export --format hf --checkpoint DIR --out OUT`: a GPT checkpoint as a
 * Hugging Face GPT-2 (OUT/model.safetensors and OUT/config.json, which
 * GPT2LMHeadModel.from_pretrained(OUT) loads; apex/gpt_hf.h has the layout). */
#ifndef APEX_TRAIN_EXPORT_H
#define APEX_TRAIN_EXPORT_H

/* argv[0] is "export". 0 on success, else an exit status after one line on stderr (2: bad flags). */
int export_main(int argc, char **argv);

#endif
