"""The layer every other uses: errors, the workdir's files, the mesh and logical axes, and the config defaults of old workdirs."""
