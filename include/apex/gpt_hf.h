/* gpt_hf.h: GPT-2 weights in Hugging Face's layout (a GPT2LMHeadModel's model.safetensors) into and
 * out of apex's GPT (models.h: apex_gpt_create).
 *
 *     apex_gpt_options o;
 *     apex_gpt_hf_sizes("gpt2/model.safetensors", &o);     vocab, n_layer, n_embd, n_positions
 *     o.n_head = 12;                                        the weights do not show it
 *     apex_module *gpt = apex_gpt_create(m, &o);
 *     apex_gpt_load_hf(m, gpt, NULL, "gpt2/model.safetensors");
 *     ...
 *     apex_gpt_save_hf(m, gpt, NULL, "out");               out/model.safetensors + out/config.json
 *
 * The layouts, for block N (Transformers' names on the left; C = n_embd):
 *   transformer.wte.weight [V, C]                 wte.weight
 *   transformer.wpe.weight [P, C]                 wpe.weight (its first rows: see apex_gpt_load_hf)
 *   transformer.h.N.ln_1.{weight,bias}            hN.ln1.{weight,bias}
 *   transformer.h.N.attn.c_attn.weight [C, 3C]    hN.attn.{q,k,v}.weight: its column blocks, transposed
 *   transformer.h.N.attn.c_attn.bias [3C]         hN.attn.{q,k,v}.bias: its thirds
 *   transformer.h.N.attn.c_proj.weight [C, C]     hN.attn.proj.weight, transposed
 *   transformer.h.N.ln_2.{weight,bias}            hN.ln2.{weight,bias}
 *   transformer.h.N.mlp.c_fc.weight [C, 4C]       hN.fc.weight [4C, C], transposed
 *   transformer.h.N.mlp.c_proj.weight [4C, C]     hN.proj.weight [C, 4C], transposed
 *   (the c_attn/c_proj/c_fc biases are the linears' biases as they are)
 *   transformer.ln_f.{weight,bias}                ln_f.{weight,bias}
 *   lm_head.weight [V, C] (optional)              none: both tie the head to wte
 * GPT-2's Conv1D stores its weight [in, out], a Linear [out, in], hence the transposes. The math is
 * the same on both sides: pre-norm blocks, layer norm eps 1e-5, attention scaled by
 * 1/sqrt(C / n_head), GELU with the tanh approximation ("gelu_new"), every linear with a bias, no
 * dropout (apex has none; the exported config sets Transformers' to 0). */
#ifndef APEX_GPT_HF_H
#define APEX_GPT_HF_H

#include "apex/amp.h"
#include "apex/models.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The sizes of the Hugging Face GPT-2 file at path: vocab and n_embd from transformer.wte.weight,
 * n_positions from transformer.wpe.weight, n_layer from the count of transformer.h.N blocks; n_head is
 * 0 (no weight shows it). Errors: NULL arguments (APEX_ERR_INVALID_ARG); an unreadable or malformed
 * file (APEX_ERR_IO / APEX_ERR_CORRUPT); a file without transformer.wte.weight, i.e. not this layout
 * (APEX_ERR_INVALID_ARG, saying so, and naming apex's own layout when the file has wte.weight);
 * embeddings of other widths or not 2-d (APEX_ERR_SHAPE); no transformer.h.0 block
 * (APEX_ERR_INVALID_ARG). */
APEX_API apex_status apex_gpt_hf_sizes(const char *path, apex_gpt_options *out);

/* Reads the file at path into gpt (a module of m made by apex_gpt_create), converting the layout as
 * above, in any float dtype the file has (rounded to nearest even into the model's dtype); a
 * parameter's f32 master (when amp keeps one; amp may be NULL) gets the f32 value. The file's vocab,
 * n_embd and n_layer must be the model's; its position table may be longer than the model's, whose
 * n_positions rows get its first rows (a model trained on shorter sequences). Everything is read and
 * checked before anything is written: a size or shape that differs (APEX_ERR_SHAPE, naming the
 * tensor and both shapes), a missing tensor (APEX_ERR_INVALID_ARG, naming it), an lm_head.weight that
 * is not transformer.wte.weight (APEX_ERR_INVALID_ARG: apex's head is tied), the errors of
 * apex_gpt_hf_sizes, or a module that is not a GPT leave the model and the masters unchanged. Tensors
 * the model has no place for (the attention's causal-mask buffers "attn.bias", "attn.masked_bias")
 * are ignored. */
APEX_API apex_status apex_gpt_load_hf(apex_model *m, apex_module *gpt, apex_amp *amp, const char *path);

/* Writes gpt's weights (amp's f32 masters where it keeps them, else the values widened to f32) in the
 * layout above to dir/model.safetensors (f32, metadata format "pt", no lm_head.weight: it is tied),
 * and a GPT2Config to dir/config.json, so that Transformers' GPT2LMHeadModel.from_pretrained(dir)
 * loads it: model_type gpt2, vocab_size, n_positions (the model's), n_embd, n_layer, n_head,
 * activation_function gelu_new, layer_norm_epsilon 1e-5, dropouts 0, tie_word_embeddings true. dir is
 * made if it does not exist (its parent must). Each file is written atomically. Errors: NULL
 * arguments or a module that is not a GPT (APEX_ERR_INVALID_ARG); a dir that cannot be made or
 * written, or a full disk (APEX_ERR_IO, with the OS's reason). */
APEX_API apex_status apex_gpt_save_hf(const apex_model *m, const apex_module *gpt, const apex_amp *amp, const char *dir);

#ifdef __cplusplus
}
#endif
#endif
