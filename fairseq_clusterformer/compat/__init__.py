"""What fairseq 0.12 lacks, made good in one place: the patches of fairseq functions (``patches``), the loss scaler's
state across a resume (``loss_scaler``), the model EMA on buffers that are set, not learned (``ema``), and the
process group destroyed at exit (``process_group``), the figures fairseq-eval-lm prints (``eval_lm_check``)."""
