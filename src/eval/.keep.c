/* Keeps the ekv_eval library non-empty while src/eval/ is being filled. */
typedef int ekv_eval_keep_translation_unit_nonempty;
