"""The zoo: the model architectures that memplan builds itself (floor 2 of the torch layer).

The CNNs (:mod:`~memplan.torch.zoo.resnet`, :mod:`~memplan.torch.zoo.vgg`,
:mod:`~memplan.torch.zoo.densenet`, :mod:`~memplan.torch.zoo.mobilenet`,
:mod:`~memplan.torch.zoo.inception`) reproduce torchvision's modules layer for layer (same
attribute names, same parameter counts, same initialisation scheme), so that
:mod:`memplan.torch.split.linearize` cuts them the same way as torchvision's own models. The
registry (:func:`memplan.torch.models.registry.build_model`) builds torchvision's own model when
``import torchvision`` works, and these copies only when it does not (torchvision's PyPI wheels do
not load beside torch's CPU build). :mod:`~memplan.torch.zoo.gpt` is memplan's own transformer.
No pretrained weights are involved: memory and time do not depend on the values of the weights.

The torchvision copies are adapted from torchvision, under its licence:

    BSD 3-Clause License

    Copyright (c) Soumith Chintala 2016,
    All rights reserved.

    Redistribution and use in source and binary forms, with or without
    modification, are permitted provided that the following conditions are met:

    * Redistributions of source code must retain the above copyright notice, this
      list of conditions and the following disclaimer.

    * Redistributions in binary form must reproduce the above copyright notice,
      this list of conditions and the following disclaimer in the documentation
      and/or other materials provided with the distribution.

    * Neither the name of the copyright holder nor the names of its
      contributors may be used to endorse or promote products derived from
      this software without specific prior written permission.

    THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
    AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
    IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
    DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR CONTRIBUTORS BE LIABLE
    FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL
    DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR
    SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER
    CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY,
    OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
    OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
"""
