"""Fine-tuning and evaluation of pretrained encoders on GLUE and SQuAD.

  glue_data      the nine GLUE tasks: task table, TSV and tfds readers, encoding
  metrics        accuracy, F1, Matthews, Pearson, Spearman (numpy)
  squad_data     SQuAD v1.1/v2.0 readers, sliding-window features, span decoding
  squad_metrics  the official SQuAD normalisation, EM/F1, HasAns/NoAns, thresholds
  heads          classifier/regressor on the first token, start/end span head
  run            `run(config, workdir)`: the fine-tuning loop behind `main.py`
  sweep          tasks x learning rates x seeds, and the median-over-seeds report
"""
